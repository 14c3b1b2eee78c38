from fleetlet.cli import run

run()
