"""The service: request pool -> FCFS token-budget batches -> runner steps -> answers (the seed's Tulip)."""
