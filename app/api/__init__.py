"""HTTP API v1: routers (health, streams, alarms, models; readings beside the engine) and their
dependencies (`deps`) and error rendering (`problems`)."""
