"""Character names as SBCL reads and prints them: the ASCII control names (Nul, Soh ... Us),
Space and Rubout, and for every other character its Unicode name with underscores."""

from __future__ import annotations

import unicodedata
from typing import Optional

CONTROL_NAMES = [
    "Nul", "Soh", "Stx", "Etx", "Eot", "Enq", "Ack", "Bel", "Backspace", "Tab", "Newline", "Vt", "Page", "Return",
    "So", "Si", "Dle", "Dc1", "Dc2", "Dc3", "Dc4", "Nak", "Syn", "Etb", "Can", "Em", "Sub", "Esc", "Fs", "Gs", "Rs", "Us",
]
C1_NAMES = (
    "C80 C81 Break-Permitted No-Break-Permitted C84 Next-Line Start-Selected-Area End-Selected-Area "
    "Character-Tabulation-Set Character-Tabulation-With-Justification Line-Tabulation-Set "
    "Partial-Line-Forward Partial-Line-Backward Reverse-Linefeed Single-Shift-Two Single-Shift-Three "
    "Device-Control-String Private-Use-One Private-Use-Two Set-Transmit-State Cancel-Character "
    "Message-Waiting Start-Guarded-Area End-Guarded-Area Start-String C99 Single-Character-Introducer "
    "Control-Sequence-Introducer String-Terminator Operating-System-Command Privacy-Message "
    "Application-Program-Command"
).split()
NAME_ALIASES = {"LINEFEED": "\n", "LF": "\n", "NL": "\n", "NULL": "\x00", "ESCAPE": "\x1b", "DELETE": "\x7f", "DEL": "\x7f", "CR": "\r", "FF": "\x0c", "SPACE": " ", "RUBOUT": "\x7f"}


def char_name(c: str) -> Optional[str]:
    """SBCL's name of a character: the ASCII control names, Space, Rubout, else the
    Unicode name with underscores."""
    code = ord(c)
    if code < 32:
        return CONTROL_NAMES[code]
    if code == 32:
        return "Space"
    if code == 127:
        return "Rubout"
    if 128 <= code < 160:
        return C1_NAMES[code - 128]
    name = unicodedata.name(c, None)
    return name.replace(" ", "_") if name else f"U{code:X}"


def name_char(name: str) -> Optional[str]:
    upper = name.upper()
    for i, control in enumerate(CONTROL_NAMES):
        if control.upper() == upper:
            return chr(i)
    for i, control in enumerate(C1_NAMES):
        if control.upper() == upper:
            return chr(128 + i)
    if upper in NAME_ALIASES:
        return NAME_ALIASES[upper]
    if upper.startswith("U+") or (upper.startswith("U") and len(upper) > 1):
        try:
            return chr(int(upper[2:] if upper.startswith("U+") else upper[1:], 16))
        except (ValueError, OverflowError):
            pass
    try:
        return unicodedata.lookup(name.replace("_", " "))
    except KeyError:
        return None


