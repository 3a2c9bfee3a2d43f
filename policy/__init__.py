"""Routing policy: the fleet (targets, pools, endpoints, prices), the rules DSL
(YAML + CEL), signals, endpoint pickers, the cost model, the ``RoutingEngine``
and the ``Decision`` it returns. Never imports FastAPI.
"""
