"""Water meters: totalizer arithmetic, the SQLite ledger, and the quarterly billing export.

Imports only `model`, `errors`, `config` (and each other)."""
