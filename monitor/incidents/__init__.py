"""Incident records for the Superintendent (issue 16): what happened, how much, what is due.

Sits above `engine`/`sinks` and below `daemon`: the daemon and `monitor replay` feed
an `IncidentTracker` the samples and conditions they judged; `monitor incidents`
and the console read the `IncidentStore`.
"""

from monitor.incidents.model import Figures, Incident, Note, NoteKind, Status
from monitor.incidents.store import IncidentStore
from monitor.incidents.tracker import IncidentTracker

__all__ = ["Figures", "Incident", "IncidentStore", "IncidentTracker", "Note", "NoteKind", "Status"]
