"""The `browser` toolset: Playwright driving the system's Chromium (toolset.py builds it).

toolset.py finds and launches Chromium (one per run, behind the egress proxy of tools/web);
session.py holds each sample's private context; tools.py the ten tools; snapshot.py, images.py
and console.py what a page may hand back, capped in the page; vision.py browser_vision's model call.
"""
