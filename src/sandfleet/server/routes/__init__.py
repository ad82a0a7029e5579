"""The ``/v1`` API's routes, one :class:`fastapi.APIRouter` per area; :mod:`sandfleet.server.app`
includes them in this order (the order of ``/openapi.json``)."""
