"""Gateway clients of the decision service.

- ``client``: ``PointsmanClient`` — asks ``POST /v1/route`` for a decision (short timeout,
  ``None`` when the service cannot answer) and reports outcomes to ``POST /v1/outcomes``
  in batches, in the background. Needs only httpx (a serving dependency).
- ``litellm_router``: the LiteLLM integration (a custom routing strategy plus an outcome
  callback on ``litellm.Router``); needs the ``litellm`` extra (``pip install 'pointsman[litellm]'``).
"""
