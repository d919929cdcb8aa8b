# The two commands of the README. Both install what they need first.
.PHONY: serve test bench
serve:
	scripts/serve.sh $(ARGS)
test:
	scripts/test.sh $(ARGS)
bench:  # benchmarks, not tests: python -m perf run (ARGS="--profile cpu --targets rose,st,ort")
	scripts/setup.sh && $${ROSE_VENV:-.venv}/bin/python -m perf run $(ARGS)
