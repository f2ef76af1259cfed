"""What becomes of each delivery on a route: decide, then write (see pipeline.py)."""

from consumers.delivery.errors import ErrorInfo, describe
from consumers.delivery.pipeline import DeliveryPipeline

__all__ = ["DeliveryPipeline", "ErrorInfo", "describe"]
