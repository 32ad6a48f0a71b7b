"""captioner"""
