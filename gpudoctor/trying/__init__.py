"""Trying fixes: the script run again with a finding's fix applied at run time, and its step measured."""
