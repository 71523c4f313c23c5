"""Session-wide settings: the test run never reaches for the network.

The machines this runs on reach only package registries; libraries that try the
Hugging Face hub, LiteLLM's model-cost map or the OpenAI trace exporter would hang on
timeouts or fail. Subprocesses started by tests inherit these.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.pop("OPENAI_API_KEY", None)  # no key: the Agents SDK's exporter never uploads
