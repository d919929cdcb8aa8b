"""The Batch API's machinery below the handlers: the durable store of files and jobs
(store.py), the upload reader (uploads.py), the input and output lines (lines.py) and the
job runner with its lease (runner.py). It knows nothing of HTTP handlers or Triton: the
runner is given the call that answers one line (gateway/http/inprocess.py)."""
