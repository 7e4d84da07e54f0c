from seal_rl.cli import entry

entry()
