"""The Isthmus server: REST API, settings, and the service that drives the executors."""

from server.app import create_app
from server.settings import Settings

__all__ = ["Settings", "create_app"]
