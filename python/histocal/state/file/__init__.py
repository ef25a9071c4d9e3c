"""The calibration state file: :mod:`.format` (the format and its limits), :mod:`.summaries` (the summaries'
members and their registry), :mod:`.write`, :mod:`.read` (untrusted input; the header: :mod:`.header`) and
:mod:`.errors`."""
