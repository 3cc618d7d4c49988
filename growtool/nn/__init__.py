"""The model core: architecture table, config, forward pass, RoPE frequencies, errors. Imports only itself: these five
files are copied whole into model folders that load with ``trust_remote_code``."""
