"""The service: request pool -> token-budget batches (interactive, then batch work) -> runner steps -> answers (the seed's Tulip)."""
