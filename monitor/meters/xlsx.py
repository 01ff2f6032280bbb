"""The quarter export as an XLSX workbook for the billing clerk (the one openpyxl adapter).

Same columns as the CSV, one sheet per quarter, and a totals row. Cells are typed so a
spreadsheet can add them up: money and volumes are numbers shown with their places
(money with two decimals), local dates are dates, UTC instants are date-times shown
with a `Z`, `minimum_applied` is a boolean. Values come from the CSV's exact text, so
the workbook and the CSV cannot disagree.

The same figures give the same bytes, whenever they are exported: a clerk files the
workbook with its SHA-256, as with the CSV. openpyxl stamps the document's created and
modified times with the clock and `zipfile` stamps every entry with it; here both are the
export's "as of" (the end of its latest quarter), and each entry is written again with
fixed attributes, in openpyxl's order.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from zipfile import ZIP_DEFLATED, ZipFile, ZipInfo

from openpyxl import Workbook
from openpyxl.styles import Font
from openpyxl.xml.constants import ARC_CORE
from openpyxl.xml.functions import tostring

from monitor.durable import replace_file
from monitor.errors import MeterError

PLACES = {  # column -> decimal places, as in the CSV
    "consumption_ft3": 3,
    "consumption_kcf": 6,
    "consumption_gal": 2,
    "average_gpd": 2,
    "charge": 2,
    "due_after_30_days": 2,
    "due_after_60_days": 2,
}
TOTALLED = ("consumption_ft3", "consumption_kcf", "consumption_gal", "charge", "due_after_30_days",
            "due_after_60_days")  # fmt: skip
READINGS = ("first_read", "last_read")
DATES = ("period_start", "period_end", "presented", "penalty_from_30", "penalty_from_60")
INSTANTS = ("period_start_utc", "period_end_utc")
Cell = str | Decimal | date | datetime | bool | None


def _format(places: int) -> str:
    return "#,##0" + ("." + "0" * places if places else "")


def _reading_format(text: str) -> str:
    """A register reading with every digit it has, no thousands separator (as the register shows it)."""
    places = len(text.partition(".")[2])
    return "0" + ("." + "0" * places if places else "")


def cell(column: str, text: str) -> Cell:
    """One CSV value as a typed cell value."""
    if text == "":
        return None
    if column in PLACES or column in READINGS:
        return Decimal(text)
    if column in DATES:
        return date.fromisoformat(text)
    if column in INSTANTS:  # Excel has no zones: a naive UTC time, shown with Z
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).replace(tzinfo=None)
    if column == "minimum_applied":
        return text == "true"
    return text


def write_xlsx(sheets: Sequence[tuple[str, list[dict[str, str]]]], path: Path, as_of: datetime) -> None:
    """One sheet per (name, rows); written beside `path` and renamed into place.

    `as_of` (an aware time: the end of the latest quarter) is the workbook's created and
    modified time and every zip entry's, in place of the clock's."""
    book = Workbook()
    book.remove(book.active)  # type: ignore[arg-type]
    for name, rows in sheets:
        sheet = book.create_sheet(title=name)
        if not rows:
            continue
        columns = list(rows[0])
        sheet.append(columns)
        for c in sheet[1]:
            c.font = Font(bold=True)
        # Rows are addressed by number: `sheet.max_row` and `sheet[n]` scan every cell, which
        # made a sheet quadratic (5,000 rows took 85 s of CPU).
        for at, row in enumerate(rows, start=2):
            sheet.append([cell(c, row[c]) for c in columns])
            for j in range(1, len(columns) + 1):  # openpyxl makes any text starting with `=` a formula
                c = sheet.cell(row=at, column=j)
                if c.data_type == "f":
                    c.data_type = "s"
            for column in READINGS:  # General shows 11 digits at most: 1.23457E+10 is no reading
                if column in columns and row[column]:
                    reading = sheet.cell(row=at, column=columns.index(column) + 1)
                    reading.number_format = _reading_format(row[column])
        last = len(rows) + 2  # the totals row
        totals: list[Cell] = [None] * len(columns)
        totals[0] = "total"
        for c in TOTALLED:
            totals[columns.index(c)] = sum((Decimal(r[c]) for r in rows), Decimal(0))
        sheet.append(totals)
        for j in range(1, len(columns) + 1):
            sheet.cell(row=last, column=j).font = Font(bold=True)
        for i, column in enumerate(columns, start=1):
            number_format = (
                _format(PLACES[column])
                if column in PLACES
                else "yyyy-mm-dd"
                if column in DATES
                else 'yyyy-mm-dd hh:mm:ss"Z"'
                if column in INSTANTS
                else None
            )
            if number_format is not None:
                for r in range(2, last + 1):
                    sheet.cell(row=r, column=i).number_format = number_format
        sheet.freeze_panes = "C2"
    data = _reproducible(book, as_of)
    try:
        replace_file(path, lambda f: f.write(data))
    except OSError as exc:
        raise MeterError(f"cannot write {path}: {exc.strerror}") from None


ZIP_DATES = (datetime(1980, 1, 1), datetime(2107, 12, 31, 23, 59, 58))  # what a zip entry can carry
ENTRY_ATTRIBUTES = 0o100644 << 16  # a regular file, rw-r--r--, whatever the umask
UNIX = 3  # zip "made by" system; zipfile's default is 0 on Windows


def _reproducible(book: Workbook, as_of: datetime) -> bytes:
    """The workbook's bytes with no trace of when or where it was written.

    openpyxl's `save` sets `modified` to now and `zipfile` dates each entry now: the
    workbook is saved to memory, then each entry copied in the same order with `as_of`
    as its date, fixed attributes, and the core properties written again with `as_of`.
    Deflate gives the same bytes for the same input with the same zlib."""
    stamp = as_of.astimezone(UTC).replace(tzinfo=None, microsecond=0)
    saved = io.BytesIO()
    book.save(saved)
    book.properties.created = book.properties.modified = stamp
    core = tostring(book.properties.to_tree())
    when = min(max(stamp, ZIP_DATES[0]), ZIP_DATES[1]).timetuple()[:6]  # 2150Q1 is a valid quarter
    out = io.BytesIO()
    with ZipFile(saved) as src, ZipFile(out, "w", ZIP_DEFLATED) as dst:
        for entry in src.infolist():
            info = ZipInfo(entry.filename, date_time=when)
            info.compress_type = ZIP_DEFLATED
            info.create_system = UNIX
            info.external_attr = ENTRY_ATTRIBUTES
            dst.writestr(info, core if entry.filename == ARC_CORE else src.read(entry))
    return out.getvalue()
