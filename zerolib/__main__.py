from zerolib.cli import run

run()
