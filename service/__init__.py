"""The decision service (FastAPI app), request/response schemas, settings and
the ``pointsman`` command-line interface.
"""
