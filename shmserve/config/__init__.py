"""Model configuration: parsing config.pbtxt, Triton's defaults and checks, JSON rendering."""
