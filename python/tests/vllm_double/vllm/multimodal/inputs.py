"""A multimodal input as the scheduler sees it (vLLM 0.26's
MultiModalFeatureSpec): its identifier (the content hash, or the user's
uuid) and where its placeholder tokens sit in the prompt."""
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class PlaceholderRange:
    offset: int
    length: int


@dataclass
class MultiModalFeatureSpec:
    identifier: Any
    mm_position: PlaceholderRange
    modality: str = "image"
    data: Optional[Any] = None
