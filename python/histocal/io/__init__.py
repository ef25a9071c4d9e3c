"""Input and output: feeds and readers, calibration data files, ORT's JSON cache, safe file I/O."""
