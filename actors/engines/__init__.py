"""kvres.actors.engines: the executor contract and the engines behind it (``llama``, ``openvino``)."""
