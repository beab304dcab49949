"""The remote protocol now lives in `roadie.protocol`: a leaf module, so the plugin SDK
imports it without importing the engine's side (this package needs the store). This name
is kept so that `from roadie.remote import protocol` goes on working."""

from __future__ import annotations

from roadie.protocol import *  # noqa: F403
