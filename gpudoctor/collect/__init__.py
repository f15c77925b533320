"""Collection: the instrumentation inside the script's process and the samplers in gpudoctor's own."""
