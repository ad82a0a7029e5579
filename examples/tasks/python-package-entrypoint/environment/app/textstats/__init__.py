"""textstats: word statistics for text files."""
from .core import WordStats, analyze, summarize

__version__ = "0.3.0"
__all__ = ["WordStats", "analyze", "summarize"]
