"""What becomes of each delivery on a route, as a package of stages (see pipeline.py)."""

from consumers.delivery.failures import ErrorInfo, describe
from consumers.delivery.pipeline import DeliveryPipeline, Mode

__all__ = ["DeliveryPipeline", "ErrorInfo", "Mode", "describe"]
