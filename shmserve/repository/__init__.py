"""The model repository on disk: model and version directories, version policies."""
