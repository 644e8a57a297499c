# Load affrun's pytest plugin: the `affinity_doctor` fixture and the --affrun-guard option.
pytest_plugins = ["launcher.pytest_plugin"]
