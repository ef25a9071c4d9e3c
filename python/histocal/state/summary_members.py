"""The summaries a state file stores, each by its :class:`~histocal.state.summary_format.SummaryMembers`
(a new summary: its members module and one entry here)."""

from __future__ import annotations

from .isotone_members import ISOTONE
from .pow2_votes_members import POW2_VOTES
from .summary_format import SummaryMembers

SUMMARY_MEMBERS: tuple[SummaryMembers, ...] = (POW2_VOTES, ISOTONE)
