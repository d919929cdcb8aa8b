# The two commands of the README. Both install what they need first.
.PHONY: serve test
serve:
	scripts/serve.sh $(ARGS)
test:
	scripts/test.sh $(ARGS)
