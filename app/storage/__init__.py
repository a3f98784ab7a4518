"""Persistence: SQLAlchemy models, engine and sessions, migrations, and the repositories.

All SQL lives in `app.storage.repositories`; callers hand them a session and never commit
themselves: the unit of work (`Database.session()`, one per request) does.
"""
