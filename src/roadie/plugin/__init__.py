"""The plugin SDK: serve a `Module` to a Roadie engine over the remote protocol.

A module is written with the same decorators as an in-process one (`roadie.registry`);
`serve_module` makes it an ASGI app (push: the engine calls it), `PullClient` makes it
poll an engine's gateway (pull: it calls the engine). Both keep the key ledger that makes
every effect exactly-once although delivery is at-least-once (DESIGN §6).

```python
from roadie.plugin import serve_module

app = serve_module(world, secret=os.environ["ROADIE_SECRET_WORLD"], ledger_path="world-keys.db")
# uvicorn mymodule:app --port 7300
```
"""

from roadie.plugin.ledger import KeyEntry, KeyLedger, KeyStatus
from roadie.plugin.pull import PullClient
from roadie.plugin.server import (
    AnswerDropped,
    Faults,
    ModuleServer,
    Reply,
    build_manifest,
    serve_module,
    wire_answer,
    wire_resource,
)

__all__ = [
    "AnswerDropped",
    "Faults",
    "KeyEntry",
    "KeyLedger",
    "KeyStatus",
    "ModuleServer",
    "PullClient",
    "Reply",
    "build_manifest",
    "serve_module",
    "wire_answer",
    "wire_resource",
]
