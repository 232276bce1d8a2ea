"""Conversation state: the own-view cache, shared by every ingress replica."""

from macaron_ray.store.base import ConversationStore, tenant_id

__all__ = ["ConversationStore", "tenant_id"]
