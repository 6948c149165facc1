"""kvres's OpenAI-compatible HTTP front on Ray Serve (``kvres serve``; docs/serving.md).

Modules, one job each:
- ``app``: the Serve deployment and its FastAPI app; ``build_app`` for ``serve run`` / ``deploy``.
- ``launch``: the ``kvres serve`` command.
- ``service``: one replica's link to kvres (sessions, threads); ``catalog``: the models offered.
- ``chat_api`` (``/v1/chat/completions``, ``/v1/completions``), ``responses_api``
  (``/v1/responses``), ``sessions_api`` (``/v1/sessions``): the routes.
- ``openai_schemas``, ``responses_schemas``, ``sampling_fields``: the requests, validated.
- ``turns``: a turn on a session, whole or streamed; ``choices``: ``n`` choices as forks of one
  prefilled session; ``text_deltas``: streamed text; ``vocab``: the model's vocabulary decoded in
  the replica.
- ``logprob_shapes``, ``input_items``: log-probabilities and a response's input items in OpenAI's
  shapes.
- ``state_actor``: stored responses, session leases and metrics shared by the replicas
  (``records``, ``leases``, ``metrics``).
- ``auth``: API keys; ``errors``: kvres's errors as HTTP answers; ``http_glue``: what routes share.

``kvres.cluster`` does not import it; the command line loads only ``launch`` and ``auth`` to build its
parser, so Serve and FastAPI load only when serving.
"""
