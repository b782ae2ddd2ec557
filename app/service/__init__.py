"""The engine bridge and model catalogue of the app: QObject + signals, no widgets."""

from app.service.catalog import HubDownloadError, describe_model, download_from_hub, model_display_name
from app.service.engine_service import EngineService
from app.service.generation import GenerationSettings, sampler_settings

__all__ = [
    "EngineService",
    "GenerationSettings",
    "HubDownloadError",
    "describe_model",
    "download_from_hub",
    "model_display_name",
    "sampler_settings",
]
