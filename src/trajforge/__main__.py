from trajforge.cli import entry

entry()
