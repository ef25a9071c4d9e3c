"""``histocal report``: an HTML page with each tensor's histogram and every method's range."""

from .page import (
    OUTLIER_THRESHOLD,
    REPORT_METHODS,
    MissingDependency,
    require_matplotlib,
    safe_file_names,
    write_report,
)

__all__ = [
    "OUTLIER_THRESHOLD",
    "REPORT_METHODS",
    "MissingDependency",
    "require_matplotlib",
    "safe_file_names",
    "write_report",
]
