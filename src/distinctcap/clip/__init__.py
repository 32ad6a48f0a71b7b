"""clip"""
