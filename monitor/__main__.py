from monitor.cli import entry

entry()
