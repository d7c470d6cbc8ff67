"""What users run: the ``datavine`` command, the AGC-style analysis, the scaling test, fault
injection and the facility model (simulation on datavine's own decisions).
"""
