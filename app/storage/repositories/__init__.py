"""One module per table. Functions take the session first, everything else by keyword.

They add, flush and query; they never commit. Dialect differences stay in here.
"""
