"""The chat fleet over HTTP: ``kvres serve`` against llama-server, the same conversations (``python -m benchmarks.chat_fleet``)."""
