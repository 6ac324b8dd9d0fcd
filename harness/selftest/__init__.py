"""The instrument measuring itself: a server of known delays to time the harness against."""
