"""Scoring twinwatch on labelled data sets (`twinwatch evaluate benchmark`)."""
