"""The built-in twin as a client of the service (`twinwatch twin`) and the one-command demo."""
