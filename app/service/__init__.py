"""What the service does, with no transport: the HTTP API, the bus and the command line are
adapters over it."""
