"""CPython programs: the command line, demos, the static server, the browser runner, the model cache, file writes."""
