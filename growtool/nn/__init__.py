"""The model core: architecture table, config, forward pass, errors. Imports only itself: these four
files are copied whole into model folders that load with ``trust_remote_code``."""
