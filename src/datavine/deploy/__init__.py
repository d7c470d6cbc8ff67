"""Starting and stopping things: local workers, HTCondor pools through ``vine_factory``,
facility files, process sessions, signals and the reaper that cleans up after a killed client.
"""
