"""Puts the repository root on sys.path so `tff_adaptive`, `tasks` and `bin` import."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
