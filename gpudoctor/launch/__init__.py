"""What runs in gpudoctor's own process while the job runs: the run directory, the script's process and its
supervisor, the samplers, the ranks followed, the manifest, and torchrun's two forms."""
