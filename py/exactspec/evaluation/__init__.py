"""The preregistered evaluation (`exactspec bench`): corpus, gates, metrics, browser runs, report, plots."""
