"""What gpudoctor draws on the terminal: the status line while the script runs (`status_line`) and the progress
line while a trace is read (`trace_progress`). Both draw only when stderr is a terminal; analysis never imports
them, it takes a progress callback instead."""
