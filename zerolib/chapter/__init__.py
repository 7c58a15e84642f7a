"""The chapter's presentation: one module per figure, the shared style, the explorers.

Everything here draws data it is given by :mod:`zerolib.core`; nothing re-runs the arithmetic.
"""
